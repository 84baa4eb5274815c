#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"

namespace mx::cli {

void add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "(not implemented yet)");
  cmd->callback([] { fail("'generate' is not implemented yet"); });
}

}  // namespace mx::cli
