"""What people read: the facts that explain a failure, report.md, and the terminal display."""
