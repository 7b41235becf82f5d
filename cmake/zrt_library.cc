// libzrt: every module's objects (CMakeLists.txt links them whole); this file is its own source only
// because a library needs one.
