/* stub.c -- placeholder until the PMEM sources land. */
__attribute__((visibility("default"))) int rtkit_pmem_version(void) { return 0; }
