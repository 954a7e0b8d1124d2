# frozen_string_literal: true

# Another route of the app: a controller Rails autoloads (and reloads in development).
class PagesController < ActionController::API
  def show
    render plain: "page #{params[:id]}"
  end
end
