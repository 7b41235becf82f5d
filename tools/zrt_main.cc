// zrt: command-line entry point. Each subcommand parses its arguments and calls a library function
// that writes to std::ostream and returns Status; exit codes: 0 ok, 1 problem found, 2 usage.
#include <CLI/CLI.hpp>

#include <iostream>

#include "runtime/core/version.h"

int main(int argc, char** argv) {
  CLI::App app{"zrt: inspect, verify and reshard ZeRO checkpoints; plan a model's memory and time"};
  app.require_subcommand(0, 1);
  bool version = false;
  app.add_flag("--version", version, "print the version and build features");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (version) {
    std::cout << "zrt " << zrt::Version() << " (" << zrt::BuildFeatures() << ")\n";
    return 0;
  }
  std::cout << app.help();
  return 2;  // no command: usage
}
