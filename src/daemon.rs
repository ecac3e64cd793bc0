//! Process setup around the server: daemonizing, the pid file, dropping privileges,
//! locking memory, raising the file descriptor limit (placeholder; being written).
