"""HareMQ's Spark data source (format "haremq") under the top-level name `pipeline`, which
jobs written before the connector moved to `haremq.pipeline` use: `pipeline.haremq_source`.

The folder this module is installed from has no `__init__.py`, so `pipeline` is a namespace
package (PEP 420): where another distribution installs a package named `pipeline`, that one is
what `import pipeline` finds, and HareMQ's own import name, `haremq.pipeline`, is unaffected.
"""
from haremq.pipeline import register  # noqa: F401
from haremq.pipeline.datasource import HareMQDataSource  # noqa: F401
