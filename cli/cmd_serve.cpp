#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"

namespace mx::cli {

void add_serve_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "(not implemented yet)");
  cmd->callback([] { fail("'serve' is not implemented yet"); });
}

}  // namespace mx::cli
