"""How the model lives in Keras: private-API use in one place, compile and its
`.keras` restore, references Keras must not track, the compute precision."""
