"""PostgreSQL access: every SQL statement of dataloader lives in this package."""
