"""dCache (seeds 000, FNAL, and 004, BNL): functional checks and scalability scans."""
