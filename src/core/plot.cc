#include "shoal/core/plot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "shoal/core/file.h"

namespace shoal {

Status check_gnuplot() {
  if (access("/usr/bin/gnuplot", X_OK) != 0)
    return not_found("gnuplot not found (apt-get install gnuplot-nox)");
  return ok_status();
}

Status render_gnuplot(const std::string& commands, const std::string& png,
                      const std::string& scratch) {
  SHOAL_RETURN_IF_ERROR(check_gnuplot());
  const std::string gp = scratch + ".gp", err = scratch + ".err";
  SHOAL_RETURN_IF_ERROR(write_file_atomic(gp, commands));
  const std::string cmd = fmt::format("timeout -k 2 60 /usr/bin/gnuplot '{}' 2>'{}'", gp, err);
  const int st = std::system(cmd.c_str());
  const int code = st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  auto complaint = read_file(err);
  std::error_code ec;
  std::filesystem::remove(gp, ec);
  std::filesystem::remove(err, ec);
  if (code != 0)
    return unavailable("gnuplot exited with {}{}: {}", code, code == 124 ? " (60 s passed)" : "",
                       complaint.ok() ? *complaint : "");
  std::filesystem::rename(png + ".tmp", png, ec);
  if (ec) return unavailable("renaming {}.tmp: {}", png, ec.message());
  return ok_status();
}

}  // namespace shoal
