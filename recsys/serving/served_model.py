"""The served model's definition, logged as MLflow's "model from code"
(``recsys.serving.mlflow_model`` passes this file as ``python_model``): MLflow runs it when the
model loads, with the ``recsys`` package shipped beside it (``code_paths``), instead of unpickling
an object."""

from mlflow.models import set_model

from recsys.serving.scorer import TabularScorer

set_model(TabularScorer())
