"""The Service Resource Manager (paper 2.8, 5.2): autoscaling that frees whole machines.

recommend.py decides a job's size (pure: the daemon and bench/bench_srm.py run the same code),
forecast.py reads the job's usage history for the predictive floor, victims.py chooses which
tasks a scale-in stops so that whole machines empty, service.py runs it all at each shard leader."""
