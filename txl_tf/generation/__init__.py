"""Generation: the compiled decoder, request checks, the sampler and its numpy
mirror, the counter RNG, and the host loop the export runtimes drive."""
