"""What the commands print and draw, one module per concern:

- :mod:`~doppler.report.text`: times and bytes as text, the methods' comparison table;
- :mod:`~doppler.report.memory_text`: a trace's peak memory against the devices' memory, as phrases;
- :mod:`~doppler.report.figures`: what every figure shares (the format from a path's extension,
  atomic saving, one colour per op kind);
- :mod:`~doppler.report.gantt_chart`: Gantt charts of simulated or executed traces;
- :mod:`~doppler.report.graph_plot`: pictures of a graph;
- :mod:`~doppler.report.training_plots`: a training run's curves and the held-out results.

Plotting only: every number drawn comes from a trace, a result or a history. matplotlib is
imported inside the drawing functions, so importing this package does not load it.
"""

from doppler.report.figures import FigureFormatError, figure_format, kind_colour, save_figure
from doppler.report.gantt_chart import gantt
from doppler.report.graph_plot import draw_graph, layered_positions
from doppler.report.memory_text import memory_overruns, shortfall_reason
from doppler.report.text import comparison_table, format_bytes, format_time, time_unit
from doppler.report.training_plots import held_out_chart, training_curve

__all__ = [
    "FigureFormatError",
    "comparison_table",
    "draw_graph",
    "figure_format",
    "format_bytes",
    "format_time",
    "gantt",
    "held_out_chart",
    "kind_colour",
    "layered_positions",
    "memory_overruns",
    "shortfall_reason",
    "save_figure",
    "time_unit",
    "training_curve",
]
