// Each subcommand registers its flags and handler on the CLI11 app. Flags are parsed once,
// here, into a plain options struct that the command passes down; nothing below cli/ reads
// argv or the environment.
#pragma once
namespace CLI { class App; }

namespace mx::cli {
void add_fixture_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_render_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
}  // namespace mx::cli
