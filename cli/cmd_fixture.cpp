#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"

namespace mx::cli {

void add_fixture_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("fixture", "(not implemented yet)");
  cmd->callback([] { fail("'fixture' is not implemented yet"); });
}

}  // namespace mx::cli
