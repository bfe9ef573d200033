"""The input pipeline of a training worker: its rows of a split (``loader``), the keyed per-epoch
shuffle (``permutation``), synthetic rows generated per rank (``synthetic``), and background
batch building (``prefetch``)."""
