/* stub.c -- placeholder until the common OS layer lands. */
