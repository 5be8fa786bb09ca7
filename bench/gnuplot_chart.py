"""Charts for the bench scripts: gnuplot over data files written into a
scratch directory, the PNG replaced only once it is whole.

render(png, script): `script(d, out)` writes its data files into the scratch
directory `d` and returns the gnuplot commands, which write the picture to
`out`. Without gnuplot the chart is skipped, saying so.
"""
import os
import shutil
import subprocess
import tempfile


def render(png, script):
    if shutil.which("gnuplot") is None:
        print("(no gnuplot: chart skipped)")
        return
    d = tempfile.mkdtemp(prefix="shoal_chart_")
    try:
        gp = os.path.join(d, "chart.gp")
        with open(gp, "w") as f:
            f.write(script(d, png + ".tmp"))
        subprocess.run(["gnuplot", gp], check=True)
        os.replace(png + ".tmp", png)
        print(f"chart: {png}")
    finally:
        shutil.rmtree(d, ignore_errors=True)
