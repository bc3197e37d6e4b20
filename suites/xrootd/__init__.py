"""XRootD (seed 003, CERN): round trip, stat and ls scans, small files, mixed I/O."""
