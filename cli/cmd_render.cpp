#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"

namespace mx::cli {

void add_render_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("render", "(not implemented yet)");
  cmd->callback([] { fail("'render' is not implemented yet"); });
}

}  // namespace mx::cli
