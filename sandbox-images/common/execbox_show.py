"""A matplotlib backend for one-shot Python runs: plt.show() becomes PNG results.

Selected with MPLBACKEND=module://execbox_show (the Python image's default); drawing is Agg's.
"""

import io

import execbox_rich
from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase


def show(*args: object, **kwargs: object) -> None:
    import matplotlib.pyplot as plt

    for number in plt.get_fignums():
        figure = plt.figure(number)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", bbox_inches="tight")
        execbox_rich.publish("display_data", {"image/png": buffer.getvalue(), "text/plain": repr(figure)})
    plt.close("all")
