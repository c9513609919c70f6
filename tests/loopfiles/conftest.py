# The .loop and YAML files here are a parser corpus, not loops to run: their
# commands (pnpm, semgrep, ...) do not exist in this repository.
collect_ignore_glob = ["*.loop", "*.loop.yaml", "*.loop.yml", "*.yaml"]
