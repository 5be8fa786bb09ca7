// `shoal simulate --png`: the policies side by side (gnuplot).
#include "shoal/core/plot.h"

#include <algorithm>
#include <filesystem>

#include "shoal/cluster/sim.h"
#include "shoal/core/file.h"

namespace shoal::cluster {

Status plot_reports(const std::vector<SimReport>& reports, const Trace& trace,
                    const std::string& png) {
  SHOAL_RETURN_IF_ERROR(check_gnuplot());
  const std::string base = png + ".plot";
  std::string bars, cdf_plot;
  for (std::size_t i = 0; i < reports.size(); ++i) {
    const SimReport& r = reports[i];
    bars += fmt::format("\"{}\"\t{:.2f}\t{:.2f}\t{:.2f}\n", r.policy, 100 * r.utilization,
                        100 * r.goodput, 100 * r.backlog_utilization);
    // The wait of every job that started, sorted: a CDF.
    std::vector<double> waits;
    for (std::size_t j = 0; j < r.first_start.size() && j < trace.jobs.size(); ++j)
      if (r.first_start[j] >= 0) waits.push_back(r.first_start[j] - trace.jobs[j].submit);
    std::sort(waits.begin(), waits.end());
    std::string tsv;
    for (std::size_t k = 0; k < waits.size(); ++k)
      tsv += fmt::format("{:.3f}\t{:.5f}\n", std::max(waits[k], 1.0), (k + 1.0) / waits.size());
    SHOAL_RETURN_IF_ERROR(write_file_atomic(fmt::format("{}.wait{}.tsv", base, i), tsv));
    cdf_plot += fmt::format("{}'{}.wait{}.tsv' using 1:2 with lines lw 2 title '{}'", i ? ", " : "",
                            base, i, r.policy);
  }
  SHOAL_RETURN_IF_ERROR(write_file_atomic(base + ".bars.tsv", bars));
  const std::string script = fmt::format(
      "set terminal pngcairo size 1200,460 noenhanced\n"
      "set output '{0}.tmp'\n"
      "set multiplot layout 1,2 title 'shoal simulate: {1}'\n"
      "set style data histograms; set style histogram clustered gap 1\n"
      "set style fill solid 0.85 border -1; set yrange [0:125]; set grid ytics\n"
      "set ylabel 'percent of chips'; set key top center horizontal maxrows 1 font ',9'\n"
      "plot '{2}.bars.tsv' using 2:xtic(1) title 'utilization', '' using 3 title 'goodput', "
      "'' using 4 title 'utilization while jobs wait'\n"
      "set style data lines; set yrange [0:1]; set logscale x; set grid xtics ytics\n"
      "set xlabel 'wait (s, from 1)'; set ylabel 'share of jobs started'; set key top left\n"
      "plot {3}\n"
      "unset multiplot\n",
      png, trace.source, base, cdf_plot);
  Status st = render_gnuplot(script, png, base);
  for (std::size_t i = 0; i < reports.size(); ++i)
    std::filesystem::remove(fmt::format("{}.wait{}.tsv", base, i));
  std::filesystem::remove(base + ".bars.tsv");
  return st;
}

}  // namespace shoal::cluster
