"""The lesson's chapters: each chapter's experiment, its conclusion rules and its figure."""
