"""engines.runtime: process utilities: child processes, CPU threads, the GC heap, progress."""
