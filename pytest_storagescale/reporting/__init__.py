"""What people read: the seeds-style table and the JSON results file."""
