// `sdpa`: inspect the build (info), explain backend selection (explain), check accuracy
// against captured model tensors (run) and benchmark (bench).

#include <exception>
#include <iostream>

#include "common.h"
#include "host.h"

int main(int argc, char** argv) {
  using namespace sdpa::cli;
  CLI::App app("sdpa: scaled dot-product attention tool", "sdpa");
  app.set_version_flag("--version", sdpa::version());
  app.require_subcommand(1);
  app.footer(
      "Exit codes: 0 ok, 1 error, 2 bad flags, 3 accuracy check failed (sdpa run).\n"
      "Run 'sdpa <command> --help' for a command's flags.");
  const Command commands[] = {add_info_command(app), add_explain_command(app),
                              add_run_command(app),
                              add_bench_command(app, sdpa::bench::command_line(argc, argv))};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (or the help); its own codes (100+) become "bad flags".
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }
  const std::string name = app.get_subcommands().front()->get_name();
  try {
    for (const Command& command : commands) {
      if (command.app->parsed()) return command.run();
    }
  } catch (const UsageError& e) {
    std::cerr << "sdpa " << name << ": " << e.what() << "\nRun 'sdpa " << name
              << " --help' for the flags.\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    // sdpa::Error (bad input files, unsupported calls) and I/O failures.
    std::cerr << "sdpa " << name << ": error: " << e.what() << '\n';
    return kExitError;
  }
  return kExitError;
}
