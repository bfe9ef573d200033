"""Train one DLRM configuration with Ray Train and print its metrics.

    python experiments/train.py        # the `debug` experiment on 2 CPU workers of a local Ray
    python experiments/train.py --experiment debug --set model.interaction=cat --set train.steps=100
    python experiments/train.py --config my.yaml --address auto --num-workers 8 --gpus

(The installed command ``recsys-train`` is the same.) Re-running with the same --name and
--storage resumes from the latest checkpoint.
"""

from recsys.cli.train import main

if __name__ == "__main__":
    main()
