// Temporaries of atomic writes that a fatal signal (Ctrl-C, kill, hang-up, a closed pipe)
// must not leave behind: while a path is registered, those signals remove it and then end
// the process as they would have (same signal, same exit status).
#pragma once

// Registers path (copied). At most 8 at once: a command has one or two temporaries, and
// beyond that (or a longer path than any writer makes) a path is simply not protected.
void tr_cleanup_add(const char *path);
// Unregisters path, e.g. once its writer has committed or aborted.
void tr_cleanup_remove(const char *path);
