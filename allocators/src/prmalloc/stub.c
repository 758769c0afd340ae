/* stub.c -- placeholder until the PRMalloc sources land: exports the step mark only. */
__attribute__((visibility("default"))) void rtkit_step_mark(void) {}
