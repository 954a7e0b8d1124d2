# frozen_string_literal: true

class CountersController < ActionController::API
  def create
    render json: { id: Counter.create!.id }, status: :created
  end

  def show
    counter = Counter.find(params[:id])
    render json: { value: counter.value, fencing_token: counter.fencing_token,
                   with_lock: Counter.instance_method(:with_lock).owner.name }
  end

  def bump
    counter = Counter.find(params[:id]) # loaded before the lock: stale once another request bumps it
    counter.bump!
    render json: { value: counter.value, fencing_token: counter.fencing_token }
  end
end
