"""Process plumbing shared by every program: supervised tasks, logging, the HTTP serving
shell, GC pauses, thread names, build information."""
