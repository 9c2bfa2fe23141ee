import matplotlib
import numpy as np
import pandas as pd

matplotlib.use("Agg")
assert pd.DataFrame({"a": np.arange(3)})["a"].sum() == 3
print("OK")
