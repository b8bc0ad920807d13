"""HareMQ's connector for PySpark Structured Streaming (format "haremq"); see pipeline/README.md.

Needs the optional extra: `pip install "haremq[spark]"`. `pipeline.datasource` holds the data
source and the reasoning behind it; `pipeline.amqp` the consumer and publisher it uses.
"""


def register(spark):
    """Register format "haremq" with a SparkSession; returns the data source class."""
    from .datasource import HareMQDataSource

    spark.dataSource.register(HareMQDataSource)
    return HareMQDataSource


def __getattr__(name):
    if name == "HareMQDataSource":  # imported lazily so `import haremq.pipeline` does not need pyspark
        from .datasource import HareMQDataSource

        return HareMQDataSource
    raise AttributeError(name)
