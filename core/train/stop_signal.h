// SIGTERM as a request to stop: what a launcher's stop or a scheduler's preemption sends. With
// checkpoint.dir set, `distlab train` installs this handler; the trainer then finishes the step it is in,
// agrees with every rank to stop (the flag rides on the step's loss average), saves a checkpoint and exits
// with 143 (128 + SIGTERM). The flag is the process's one piece of global state: a signal handler can
// reach nothing else.
#pragma once

namespace distlab {

void install_stop_handler();  // SIGTERM sets the flag (a second SIGTERM is still just the flag)
bool stop_requested();
// the SIGTERM came from this rank's launcher (`distlab run` forwards one to every worker), so no single
// rank was the one sent it
bool stop_from_launcher();

}  // namespace distlab
