// The checksum for every x86-64 CPU (SSE2) and other architectures (checksum.inc).
#define ZRT_CHECKSUM_NS generic
#include "checksum.inc"
