// Charts through gnuplot, the way every PNG Shoal writes is written (the
// trainer's metrics.png, shoal simulate --png): the commands draw into
// png + ".tmp" and the picture replaces the old one only once it is whole.
#pragma once

#include <string>

#include "shoal/core/status.h"

namespace shoal {

// OK when /usr/bin/gnuplot is there; else an error that says how to get it.
Status check_gnuplot();
// Runs /usr/bin/gnuplot (at most 60 s) on `commands`, which must set its
// output to png + ".tmp"; `scratch` is a path prefix for the script and
// gnuplot's errors, removed afterwards. Errors name gnuplot's complaint.
Status render_gnuplot(const std::string& commands, const std::string& png,
                      const std::string& scratch);

}  // namespace shoal
