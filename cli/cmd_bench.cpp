#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"

namespace mx::cli {

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "(not implemented yet)");
  cmd->callback([] { fail("'bench' is not implemented yet"); });
}

}  // namespace mx::cli
