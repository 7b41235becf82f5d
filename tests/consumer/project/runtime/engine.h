// The consumer's own header named like one of zrt's: zrt's headers must never pick it up.
#pragma once
namespace consumer {
inline constexpr const char* kMine = "own runtime/engine.h";
}  // namespace consumer
