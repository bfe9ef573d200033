"""Export a trained model for serving: INT8 (or INT4 / FP16) TorchRec tables, left unsharded,
traced and scripted; checked against FP32 on the test split; logged as an MLflow model.

    python experiments/export.py --sweep default --register dlrm-default
    python experiments/export.py --checkpoint runs/debug/step_00000200 --experiment debug

(The installed command ``recsys-export`` is the same.)
"""

from recsys.cli.export import main

if __name__ == "__main__":
    main()
