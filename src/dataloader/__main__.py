"""`python -m dataloader` starts the service (HTTP API + workers + reaper)."""

from dataloader.cli import serve_main

if __name__ == "__main__":
    serve_main()
