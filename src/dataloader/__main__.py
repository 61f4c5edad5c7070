"""`python -m dataloader`: the `dataloader` command; without a command it starts the service."""

from dataloader.cli import main

if __name__ == "__main__":
    main()
