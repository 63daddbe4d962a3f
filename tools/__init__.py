"""Tools that sit beside the needle package, run from the repository checkout: the test
cluster of network namespaces (``testcluster/``), the planner's measuring workers
(``measure/``), the GPU check, the mutation runner and the sanitizer driver."""
