// The checksum with AVX2 (checksum.inc; compiled with -mavx2, used only on CPUs that have it).
#define ZRT_CHECKSUM_NS avx2
#include "checksum.inc"
