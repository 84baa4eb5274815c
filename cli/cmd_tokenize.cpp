#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"

namespace mx::cli {

void add_tokenize_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "(not implemented yet)");
  cmd->callback([] { fail("'tokenize' is not implemented yet"); });
}

}  // namespace mx::cli
