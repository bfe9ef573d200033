"""Sweep DLRM configurations with Ray Tune; every trial is a Ray Train job; MLflow records all.

    python experiments/sweep.py        # the `default` space: local Ray, ./mlflow.db, ./runs
    python experiments/sweep.py --space criteo --address auto --gpus --num-workers 8 \\
        --storage /shared/sweeps --tracking-uri http://mlflow:5000
    python experiments/sweep.py --name default --resume   # pick a killed sweep up again
    mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1   # compare the runs

(The installed command ``recsys-sweep`` is the same.) Re-running with the same --name resumes
too: finished trials stay finished, unfinished ones continue from their last checkpoint.
"""

from recsys.cli.sweep import main

if __name__ == "__main__":
    main()
