import matplotlib
import numpy as np
import pandas as pd

matplotlib.use("Agg")
frame = pd.DataFrame({"a": np.arange(3)})
assert frame["a"].sum() == 3
assert frame.to_markdown().startswith("|")  # tabulate is there
print("OK")
