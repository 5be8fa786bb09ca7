// A stop asked for from outside (Ctrl-C, a SIGTERM from a launcher or a
// scheduler's cancel): the training loop reads it at each step boundary,
// writes a checkpoint and ends. Installing the handlers is the binary's
// choice; a library user (Python) keeps its own.
// Thread-safe: the handler writes a lock-free atomic the loop reads.
#pragma once

namespace shoal {

// Installs SIGINT and SIGTERM handlers that record the signal; a second
// one ends the process at once with the default action (a user pressing
// Ctrl-C twice means now). The handler runs on a thread of its own: the
// caller, and every thread it starts afterwards, blocks the two signals.
void catch_stop_signals();

// The signal that asked to stop (SIGINT, SIGTERM), or 0.
int stop_signal();

}  // namespace shoal
