"""Tools that sit beside the needle package, run from the repository checkout: the test
cluster of network namespaces (``testcluster/``), the planner's measuring workers
(``measure/``), the GPU check and the mutation runner."""
