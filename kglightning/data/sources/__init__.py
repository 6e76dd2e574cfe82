"""Record sources: file, dataset and hub loaders (:mod:`.loaders`) and the embedded benchmark builder."""

from kglightning.data.sources.loaders import SUPPORTED_FORMATS, RecordList, read_questions, read_records, write_records

__all__ = ["SUPPORTED_FORMATS", "RecordList", "read_questions", "read_records", "write_records"]
