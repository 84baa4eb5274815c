#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"

namespace mx::cli {

void add_inspect_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "(not implemented yet)");
  cmd->callback([] { fail("'inspect' is not implemented yet"); });
}

}  // namespace mx::cli
