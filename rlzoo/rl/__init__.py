"""The RL step: the loop, rollouts and their schedule (overlap), scoring, the objective, the learners, the critic, the teacher and the KL in the reward."""
