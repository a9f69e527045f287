"""The pipeline.yaml schema: frozen pydantic models, read through `etl.yaml_file`.

Every other module receives a `PipelineConfig` and never looks at the file again. Errors name
the key path and the YAML line (`pipeline.yaml:12: stages[1].resize.size: ...`).

Modules:
- `codec`:    the `output.codec` section: how samples are stored (raw, JPEG, zlib)
- `columns`:  the `columns:` section: per-sample columns a source carries
- `fields`:   what every model shares: strict frozen models, byte sizes, colours, locations
- `loading`:  `load_config`: pipeline.yaml -> PipelineConfig
- `pipeline`: the output and run sections, and `PipelineConfig`
- `sources`:  the `source:` section, one model per source kind
- `stages`:   the `stages:` section, one model per stage kind
"""

from etl.config.codec import CODEC_KINDS, CodecConfig
from etl.config.fields import ByteSize, Color, StrictModel, parse_byte_size
from etl.config.loading import MAX_CONFIG_BYTES, MAX_DEPTH, load_config
from etl.config.pipeline import (
    BACKENDS,
    SHARD_BYTES,
    Backend,
    OutputConfig,
    PipelineConfig,
    RunConfig,
    changed_keys,
)
from etl.config.sources import (
    DEFAULT_INCLUDE,
    IMAGE_EXTENSIONS,
    SOURCE_KINDS,
    FilePatterns,
    FolderSource,
    ListingSource,
    LmdbSource,
    ParquetSource,
    PythonSource,
    Source,
    SourceConfig,
    WebDatasetSource,
)
from etl.config.stages import (
    DEFAULT_FORMATS,
    EXTERNAL_PROGRAM_FORMATS,
    CallStage,
    DecodeStage,
    ResizeStage,
    Stage,
    ValidateStage,
)

__all__ = [
    "BACKENDS",
    "CODEC_KINDS",
    "DEFAULT_FORMATS",
    "DEFAULT_INCLUDE",
    "EXTERNAL_PROGRAM_FORMATS",
    "IMAGE_EXTENSIONS",
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "SHARD_BYTES",
    "SOURCE_KINDS",
    "Backend",
    "ByteSize",
    "CallStage",
    "CodecConfig",
    "Color",
    "DecodeStage",
    "FilePatterns",
    "FolderSource",
    "ListingSource",
    "LmdbSource",
    "OutputConfig",
    "ParquetSource",
    "PipelineConfig",
    "PythonSource",
    "ResizeStage",
    "RunConfig",
    "Source",
    "SourceConfig",
    "Stage",
    "StrictModel",
    "ValidateStage",
    "WebDatasetSource",
    "changed_keys",
    "load_config",
    "parse_byte_size",
]
