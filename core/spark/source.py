"""The ``mqstore`` data source: what ``format("mqstore")`` resolves to.

Spark pickles this class to its Python workers by reference, so it must stay importable as
``mqstore.spark.source.MqstoreDataSource`` wherever Spark runs Python (the ``spark`` extra
installed in the interpreter PYSPARK_PYTHON names). Options are parsed when Spark asks for a
reader or writer, in its planner worker: a bad option fails the query before any task runs.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

from mqstore.spark.batch_reader import BatchReader
from mqstore.spark.options import OptionError, parse_read_options, parse_write_options
from mqstore.spark.schema import message_schema
from mqstore.spark.stream_reader import StreamReader
from mqstore.spark.writer import BatchWriter, StreamWriter

NAME = "mqstore"


def _fixed_schema(schema) -> None:
    if schema is not None and schema.simpleString() != message_schema().simpleString():
        raise OptionError(f"an mqstore read has a fixed schema ({message_schema().simpleString()});"
                          f" leave out .schema(), got {schema.simpleString()}")


class MqstoreDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        return message_schema()

    def reader(self, schema):
        _fixed_schema(schema)
        return BatchReader(parse_read_options(self.options, streaming=False))

    def streamReader(self, schema):
        _fixed_schema(schema)
        return StreamReader(parse_read_options(self.options, streaming=True))

    def writer(self, schema, overwrite: bool):
        if overwrite:
            raise OptionError("mqstore only appends: use mode('append'), not mode('overwrite')")
        return BatchWriter(parse_write_options(self.options), schema)

    def streamWriter(self, schema, overwrite: bool):
        return StreamWriter(parse_write_options(self.options), schema)


__all__ = ["NAME", "MqstoreDataSource"]
