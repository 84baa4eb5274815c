// mxserve: one binary, several subcommands (serve, generate, bench, fixture, tokenize, render).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"

int main(int argc, char** argv) {
  CLI::App app{"mxserve: inference engine and OpenAI-compatible server for gpt-oss"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("mxserve ") + MXSERVE_VERSION);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "debug|info|warn|error|off")->capture_default_str();
  app.parse_complete_callback([&] { mx::log::set_level(mx::log::parse_level(log_level)); });

  mx::cli::add_serve_command(app);
  mx::cli::add_generate_command(app);
  mx::cli::add_bench_command(app);
  mx::cli::add_fixture_command(app);
  mx::cli::add_tokenize_command(app);
  mx::cli::add_render_command(app);
  mx::cli::add_inspect_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const mx::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
