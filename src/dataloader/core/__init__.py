"""Rules without I/O shared by the HTTP API, the library and the workers."""
