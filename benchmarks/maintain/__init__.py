"""Looking after a dataset: audits and reports.

Modules:
- `audit`:  how fast `etl audit` verifies shards, against sha256sum
- `report`: the report stays bounded whatever the dataset's size
"""
